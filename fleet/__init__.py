"""llmsla.fleet"""
