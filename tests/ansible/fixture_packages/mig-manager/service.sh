#!/usr/bin/env bash
# Fixture of mig-parted's service.sh: at boot, regenerate the package's own config from the hardware, then apply
# the selected config (MIG_PARTED_CONFIG_FILE defaults to that regenerated file), rebooting at most once when the
# MIG mode cannot take effect without one.
here="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
source "${here}/utils.sh"

nvidia-mig-parted generate-config -f "${here}/config.yaml" || echo "Warning: config generation failed" >&2
: "${MIG_PARTED_CONFIG_FILE:=${here}/config.yaml}"
: "${MIG_PARTED_SELECTED_CONFIG:?must be set in the unit}"
export MIG_PARTED_CONFIG_FILE MIG_PARTED_SELECTED_CONFIG
gpusim event boot-apply "${MIG_PARTED_SELECTED_CONFIG}"

if ! nvidia-mig-parted assert --mode-only; then
	if ! nvidia-mig-parted apply --mode-only; then
		echo "the MIG mode change needs a GPU reset that is not available here: rebooting" >&2
		nvidia-mig-manager::service::reboot
		exit $?
	fi
fi
nvidia-mig-manager::service::clear_reboot_state
nvidia-mig-parted apply || exit 1
nvidia-mig-parted export
