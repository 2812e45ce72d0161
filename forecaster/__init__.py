"""llmsla.forecaster"""
