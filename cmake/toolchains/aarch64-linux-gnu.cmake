# Cross-compiling for 64-bit ARM Linux (Raspberry Pi 4/5, Ampere, Graviton,
# Apple silicon under Linux) from an x86-64 Debian machine, with Debian's
# cross toolchain and its multiarch libraries:
#   dpkg --add-architecture arm64 && apt-get update
#   apt-get install g++-aarch64-linux-gnu qemu-user \
#     libsqlite3-dev:arm64 libssl-dev:arm64 libpcre2-dev:arm64 libtomlplusplus-dev:arm64 \
#     libcpp-httplib-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64
# (scripts/setup --aarch64 does this). Header-only libraries (nlohmann/json,
# CLI11, Boost) are found in /usr/include as for the host build; libraries
# with compiled parts are the arm64 packages in /usr/lib/aarch64-linux-gnu,
# which CMake searches by the compiler's multiarch name, so no sysroot is
# needed. Tests run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), which
# loads the arm64 libraries through /lib/ld-linux-aarch64.so.1 (libc6:arm64).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
find_program(SPW_QEMU_AARCH64 qemu-aarch64)
if(SPW_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${SPW_QEMU_AARCH64})
endif()
# pkg-config (toml++, cpp-httplib, PCRE2) must read the arm64 .pc files, not
# the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
