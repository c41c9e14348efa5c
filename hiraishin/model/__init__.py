"""hiraishin.model"""
