"""dgxdoctor.diagnose"""
