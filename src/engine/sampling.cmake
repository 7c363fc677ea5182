# Owned by the sampler work. Keep this file valid CMake at all times.
