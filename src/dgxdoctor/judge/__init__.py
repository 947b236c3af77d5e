"""Pure verdicts per failure domain: values in, Findings out; shared by checks and ``diagnose``."""
