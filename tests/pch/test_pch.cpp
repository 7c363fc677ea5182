// The target that builds the tests' shared precompiled header (CMakeLists.txt:
// spw_test_pch); every test source reuses it. Nothing to compile of its own.
