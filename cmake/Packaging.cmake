# Installation (`cmake --install`) and the Debian package (`cpack -G DEB`),
# included from the top-level CMakeLists.txt after every target is defined.
#
# Installed, in the GNUInstallDirs layout under the prefix:
#   bin/spillway                                   the server and CLI
#   share/spillway/models/stories260K.gguf         the bundled model
#   share/doc/spillway/                            README.md and docs/*.md
#   lib/systemd/system/spillway.service            packaging/spillway.service
#   etc/spillway/spillway.toml (/etc/... for /usr) packaging/spillway.toml
# Nothing else: tests, benchmarks and fuzzers have no install rules, and
# neither has spillway-gen-model, a developer tool for test and benchmark
# models whose default vocabulary is a file of the source tree
# (tests/data/ggml-vocab-llama-spm.gguf).
#
# The unit and the config name installed paths (/usr/bin/spillway,
# /etc/spillway/spillway.toml, /usr/share/spillway/models/...). The files in
# packaging/ are written for the package's prefix, /usr, and installed as
# they are there; under another prefix (`cmake --install build/release`
# defaults to /usr/local) the copies installed name that prefix's paths
# instead. That is decided when the install runs, from the prefix it runs
# with, because cpack and `cmake --install --prefix P` choose it then.
#
# The binary is the build's: built for x86-64-v2 with the CPU kernels once
# per ISA level, chosen at start (src/backend/cpu/kernel_variant.h), so the
# package runs on any x86-64 CPU since 2008. A build with SPILLWAY_NATIVE=ON
# runs only on CPUs like the build machine's.

include(GNUInstallDirs)

set(SPILLWAY_SYSTEMD_UNIT_DIR "lib/systemd/system"
    CACHE STRING "Where spillway.service is installed: relative to the install prefix, or absolute")
set(SPILLWAY_DEB_MAINTAINER "Spillway maintainers <maintainers@users.noreply.a-seed-bbd20a2b.example>"
    CACHE STRING "Maintainer field of the Debian package")

install(TARGETS spillway RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/models/stories260K.gguf
        DESTINATION ${CMAKE_INSTALL_DATADIR}/spillway/models)
install(FILES ${PROJECT_SOURCE_DIR}/README.md
              ${PROJECT_SOURCE_DIR}/docs/ARCHITECTURE.md
              ${PROJECT_SOURCE_DIR}/docs/DRILL.md
              ${PROJECT_SOURCE_DIR}/docs/PERFORMANCE.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The unit and the config, with their paths for the prefix of this install.
# Install-time code: the values of this configuration are passed in first.
install(CODE "
set(_spw_packaging \"${PROJECT_SOURCE_DIR}/packaging\")
set(_spw_staging \"${PROJECT_BINARY_DIR}/packaging-staging\")
set(_spw_bindir \"${CMAKE_INSTALL_BINDIR}\")
set(_spw_datadir \"${CMAKE_INSTALL_DATADIR}\")
set(_spw_docdir \"${CMAKE_INSTALL_DOCDIR}\")
set(_spw_unitdir \"${SPILLWAY_SYSTEMD_UNIT_DIR}\")
")
install(CODE [[
# Without trailing slashes ("" for /), so that "${_spw_prefix}/bin" is a path.
string(REGEX REPLACE "/+$" "" _spw_prefix "${CMAKE_INSTALL_PREFIX}")
# GNUInstallDirs' rule for the configuration directory: /etc for the / and
# /usr prefixes, PREFIX/etc for any other.
if(_spw_prefix STREQUAL "" OR _spw_prefix STREQUAL "/usr")
  set(_spw_etc "/etc")
else()
  set(_spw_etc "${_spw_prefix}/etc")
endif()
if(IS_ABSOLUTE "${_spw_unitdir}")
  set(_spw_unit_dest "${_spw_unitdir}")
else()
  set(_spw_unit_dest "${_spw_prefix}/${_spw_unitdir}")
endif()
# The same file names as in packaging/, in a folder per prefix.
string(MD5 _spw_key "${_spw_prefix}")
set(_spw_out "${_spw_staging}/${_spw_key}")
foreach(_spw_file spillway.service spillway.toml)
  file(READ "${_spw_packaging}/${_spw_file}" _spw_text)
  if(NOT _spw_prefix STREQUAL "/usr")
    string(REPLACE "/usr/bin/spillway" "${_spw_prefix}/${_spw_bindir}/spillway" _spw_text "${_spw_text}")
    string(REPLACE "/etc/spillway/" "${_spw_etc}/spillway/" _spw_text "${_spw_text}")
    string(REPLACE "/usr/share/spillway/" "${_spw_prefix}/${_spw_datadir}/spillway/" _spw_text "${_spw_text}")
    string(REPLACE "/usr/share/doc/spillway/" "${_spw_prefix}/${_spw_docdir}/" _spw_text "${_spw_text}")
  endif()
  file(WRITE "${_spw_out}/${_spw_file}" "${_spw_text}")
endforeach()
file(INSTALL DESTINATION "${_spw_unit_dest}" TYPE FILE FILES "${_spw_out}/spillway.service")
file(INSTALL DESTINATION "${_spw_etc}/spillway" TYPE FILE FILES "${_spw_out}/spillway.toml")
]])

# ---- The Debian package -------------------------------------------------
# `cpack -G DEB` (or plain `cpack`) in the build directory writes
# spillway_<version>-1_<arch>.deb. Its install runs with DESTDIR set
# (CPACK_SET_DESTDIR) and the prefix /usr (CPACK_INSTALL_PREFIX, which is
# the build's CMAKE_INSTALL_PREFIX otherwise), so the code above sees the
# package's prefix and /etc/spillway is packaged where it belongs.
set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "spillway")
set(CPACK_PACKAGE_VENDOR "Spillway")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "${SPILLWAY_DEB_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "local AI serving gateway for a shared home-server GPU")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "Spillway serves GGUF llama models over an OpenAI-compatible HTTP API with\n"
  "its own inference engine, on the CPU and on Vulkan GPUs. Each request is\n"
  "priced against GPU and host memory before it runs, then admitted, delayed,\n"
  "shrunk, offloaded or redirected to a CPU path, and every response says\n"
  "which. Requests are journaled (SQLite) and can be resumed after a crash.\n"
  "Ships a sandboxed systemd unit (not enabled on install), a default\n"
  "config and the small stories260K model to try it with.")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_INSTALL_PREFIX "/usr")
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${SPILLWAY_DEB_MAINTAINER}")
# Depends: from the shared libraries the binary links (dpkg-shlibdeps).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The aarch64 cross build's package is arm64: CPack would otherwise ask dpkg
# for the build machine's architecture. dpkg-shlibdeps reads the ARM binary
# as it is and finds its libraries' arm64 packages (scripts/setup --aarch64).
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
endif()
# conffiles: dpkg keeps an edited /etc/spillway/spillway.toml on upgrades and
# asks before replacing it. Maintainer scripts: systemd's daemon-reload
# around the unit file, each step skipped without a running systemd.
file(WRITE ${PROJECT_BINARY_DIR}/packaging-staging/conffiles "/etc/spillway/spillway.toml\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_BINARY_DIR}/packaging-staging/conffiles
    ${PROJECT_SOURCE_DIR}/packaging/postinst
    ${PROJECT_SOURCE_DIR}/packaging/prerm
    ${PROJECT_SOURCE_DIR}/packaging/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# `make package_source` would otherwise archive build trees and node_modules.
set(CPACK_SOURCE_IGNORE_FILES "/[.]git/" "/build/" "/node_modules/")
include(CPack)
