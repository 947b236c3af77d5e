"""dgxdoctor.alerts"""
