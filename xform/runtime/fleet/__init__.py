"""Many bundles in one place (issue 45): what each translates (languages.py), a directory of them
(catalog.py), which to ask for a pair (routes.py), which stay loaded (pool.py), and the Python
door over them (translator.py: `xform.Translator(DIR)`). Pure Python over the runtime: the Triton
server of many bundles builds on the same catalog, routes and pool.
"""
