"""llmsla.dashboards"""
