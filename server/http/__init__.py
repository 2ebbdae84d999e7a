"""A worker's REST transport: create_app(), the Flask views (TF Serving, V2, health, metrics, OpenAPI) and the fast path.

Imported in workers only (gunicorn loads the WSGI app after fork, preload_app is off). Views take
care of HTTP (paths, bodies, status codes, headers) and call the dataplane (server.dataplane).
"""
