"""llmsla.alerting"""
