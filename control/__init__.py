"""llmsla.control"""
