"""hiraishin.kernels"""
