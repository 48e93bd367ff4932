# Fixture of mig-parted's utils.sh: service start/stop helpers and the at-most-once reboot.
mig_manager_statedir=/var/lib/nvidia-mig-manager

function nvidia-mig-manager::service::reverse_array() {
	local -n _in="${1}"
	local -n _out="${2}"
	for item in "${_in[@]}"; do
		_out=("${item}" "${_out[@]}")
	done
}

function nvidia-mig-manager::service::enabled() {
	[ "$(systemctl is-enabled "${1}" 2>/dev/null)" = "enabled" ]
}

function nvidia-mig-manager::service::stop_systemd_services() {
	local -n _services="${1}"
	for s in "${_services[@]}"; do
		nvidia-mig-manager::service::enabled "${s}" || continue
		systemctl stop "${s}" || return 1
	done
}

function nvidia-mig-manager::service::start_systemd_services() {
	local -n _services="${1}"
	for s in "${_services[@]}"; do
		nvidia-mig-manager::service::enabled "${s}" || continue
		systemctl start ${2:-} "${s}" || return 1
	done
}

function nvidia-mig-manager::service::persist_config_across_reboot() {
	mkdir -p /etc/systemd/system/nvidia-mig-manager.service.d
	printf '[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=%s"\n' "${1}" \
		> /etc/systemd/system/nvidia-mig-manager.service.d/override.conf
	systemctl daemon-reload
}

function nvidia-mig-manager::service::reboot() {
	mkdir -p "${mig_manager_statedir}"
	if [ -f "${mig_manager_statedir}/reboot_attempted" ]; then
		echo "Machine already rebooted once -- not attempting again" >&2
		return 1
	fi
	touch "${mig_manager_statedir}/reboot_attempted"
	systemctl reboot
}

function nvidia-mig-manager::service::clear_reboot_state() {
	rm -f "${mig_manager_statedir}/reboot_attempted"
}
