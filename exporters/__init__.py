"""llmsla.exporters"""
