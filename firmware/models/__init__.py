"""Small networks for the accelerator: training scripts and their committed float weights."""
