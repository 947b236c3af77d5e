"""dgxdoctor.daemon"""
