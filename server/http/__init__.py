"""A worker's request threads: create_app(), the API views (TF Serving, V2, health, metrics, OpenAPI) and codecs.

Imported in workers only (gunicorn loads the WSGI app after fork, preload_app is off). Views take
care of HTTP and delegate: codecs turn bodies into numpy arrays and back, the registry's executors
run the model. Nothing here imports tensorflow or keras at import time.
"""
