"""roundoff: bit-exact emulation of low-precision arithmetic units, from Python.

The package lives in build/python/roundoff/ after `meson compile -C build`;
`export PYTHONPATH=$PWD/build/python` makes `import roundoff` work.
"""
