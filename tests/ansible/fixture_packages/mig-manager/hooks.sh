# Fixture of mig-parted's hooks.sh: which GPU clients stop before a MIG change and start after it.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/utils.sh"

driver_services=(
	nvsm.service
	nvidia-dcgm.service
)

k8s_services=(
	dcgm-exporter.service
	kubelet.service
)

function stop_driver_services() {
	local services=()
	nvidia-mig-manager::service::reverse_array driver_services services
	nvidia-mig-manager::service::stop_systemd_services services
}

function start_driver_services() {
	local args=""
	case "$(systemctl is-system-running 2>/dev/null)" in
		running|degraded) ;;
		*) args="--no-block" ;;
	esac
	nvidia-mig-manager::service::start_systemd_services driver_services "${args}"
}

function stop_k8s_services() {
	local services=()
	nvidia-mig-manager::service::reverse_array k8s_services services
	nvidia-mig-manager::service::stop_systemd_services services
}

function start_k8s_services() {
	nvidia-mig-manager::service::start_systemd_services k8s_services
}

function persist-config() {
	nvidia-mig-manager::service::persist_config_across_reboot "${1}"
}

function pre-apply-mode() {
	stop_k8s_services || return 1
	stop_driver_services || return 1
}

function pre-apply-config() {
	stop_k8s_services || return 1
}

function apply-exit() {
	start_driver_services || return 1
	start_k8s_services || return 1
}

function refresh-cdi() {
	if systemctl list-unit-files --quiet nvidia-cdi-refresh.service >/dev/null 2>&1; then
		systemctl restart nvidia-cdi-refresh.service || echo "Error: failed to refresh CDI specs" >&2
	fi
}
