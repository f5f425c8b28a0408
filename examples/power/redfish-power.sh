#!/bin/sh
# Power an aicluster node down or up through its BMC's Redfish API.
# Usage: redfish-power.sh GracefulShutdown|On NODE   (examples/power/redfish.yaml)
# Credentials: a netrc file naming each BMC (machine NODE-bmc login ... password ...), mode 0600.
set -eu
reset_type=$1
node=$2
exec curl --fail --silent --show-error --max-time 60 --netrc-file "$REDFISH_CREDENTIALS_FILE" \
  -H "Content-Type: application/json" -X POST \
  -d "{\"ResetType\": \"$reset_type\"}" \
  "https://${node}-bmc/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
