"""TensorFlow Serving's API: its REST JSON and its protobuf wire forms."""
