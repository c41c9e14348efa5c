"""hiraishin.decode"""
