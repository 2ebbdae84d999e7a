"""Payload logging: a sampled share of inference requests, inputs and outputs, written off the request path (worker only).

capture (the request path: one `if capture.ON`), record (what a logged request becomes), writer
(the bounded queue and its thread), file_sink and http_sink (where records go).
"""
