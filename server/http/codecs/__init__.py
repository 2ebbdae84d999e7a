"""Request and response formats: JSON, base64, images, TF Serving's and V2's tensors (request threads).

Pure functions from bodies to numpy arrays checked against a signature, and back; testable
without a model. The tf.Example codec imports TensorFlow's protobuf classes inside a worker only.
"""
