#!/bin/sh
# Power an aicluster node down or up through its BMC with ipmitool (IPMI over LAN).
# Usage: ipmi-power.sh soft|on NODE   (the script provider appends NODE; examples/power/ipmi.yaml)
# The BMC of node NODE answers at NODE-bmc (your naming may differ: change BMC below).
# "soft" asks the OS to shut down (ACPI); the node's Ray processes stop with it. After "on", the
# machine boots and its ray start unit (docs/deploy.md, section 2) joins the cluster again: the
# control plane counts the resume done when Ray reports the node alive.
set -eu
action=$1
node=$2
BMC="${node}-bmc"
exec ipmitool -I lanplus -H "$BMC" -U "${IPMI_USER:-admin}" -f "$IPMI_PASSWORD_FILE" \
  chassis power "$action"
