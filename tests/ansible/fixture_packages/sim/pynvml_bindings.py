"""The NVML Python bindings on gpushare's test hosts (fixture package python3-pynvml, installed as `pynvml`).

Like nvidia-ml-py, which loads libnvidia-ml.so from the driver, this module loads the NVML the driver fixture
package installs (the simulator, /usr/lib/gpusim/pynvml.py). Without the driver, importing works and nvmlInit
fails with NVML_ERROR_LIBRARY_NOT_FOUND, as it does on a host without an NVIDIA driver.
"""

import importlib.util
import os

_LIBRARY = os.path.join(os.environ.get("GPUSIM_LIB", "/usr/lib/gpusim"), "pynvml.py")

if os.path.exists(_LIBRARY):
    _spec = importlib.util.spec_from_file_location("_gpusim_nvml", _LIBRARY)
    _nvml = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_nvml)
    globals().update({k: v for k, v in vars(_nvml).items() if not k.startswith("__")})
else:
    class NVMLError(Exception):
        value = 999

        def __str__(self):
            return "NVML Shared Library Not Found" if self.value == 12 else "Unknown Error"

    class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - nvidia-ml-py's names
        value = 12

    class NVMLError_Uninitialized(NVMLError):  # noqa: N801
        value = 1

    class NVMLError_NotSupported(NVMLError):  # noqa: N801
        value = 3

    def nvmlInit():  # noqa: N802
        raise NVMLError_LibraryNotFound()

    def nvmlShutdown():  # noqa: N802
        raise NVMLError_Uninitialized()
