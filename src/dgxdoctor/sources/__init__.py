"""dgxdoctor.sources"""
