"""llmsla.streaming"""
