"""dgxdoctor.exporters"""
