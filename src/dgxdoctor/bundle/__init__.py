"""``dgxdoctor bundle``: the evidence of one node or the whole cluster in one archive for a support ticket.

``items`` says what a part holds, ``collect`` runs it under a deadline and a size cap, ``redact`` keeps secrets
out, ``archive`` writes and reads the tar.gz, ``build`` puts this node's and the peers' parts together.
"""
