"""The folder `ddpguard run -- COMMAND` puts first on PYTHONPATH: it holds only the
`sitecustomize` that hooks every Python process of the command's tree."""
