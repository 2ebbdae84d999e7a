"""Tensor rules every API shares: JSON values and images to numpy, declared sizes, validation against a signature."""
