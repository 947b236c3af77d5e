"""The settings of the layers above the checks (daemon, remediation, alerts, bundle), low in the layers.

``config`` assembles them with every check's own model into the one validated config; the layers that use them
import only what they need from here (``remediation.guard`` needs ``RemediationSettings``, not every check).
"""
