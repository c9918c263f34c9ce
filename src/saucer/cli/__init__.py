"""saucer.cli"""
