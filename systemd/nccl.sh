# /etc/profile.d/nccl.sh: shells get the same variables as the systemd units, from one file.
set -a
. /etc/nccl.env
set +a
