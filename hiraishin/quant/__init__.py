"""hiraishin.quant"""
