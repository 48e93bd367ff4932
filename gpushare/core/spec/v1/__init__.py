"""Version 1 (`apiVersion: gpushare.io/v1`) of the environment and profile files, one module each over the ones
after it: environment (the environment file), profiles (sharing profiles and what each kind isolates), patterns
(the strings both are made of). gpushare.core.spec names the current version's models; a file format that changes
incompatibly gets a v2 beside this one, as NVIDIA's mig-parted keeps api/spec/v1."""
