"""dgxdoctor.remediation"""
