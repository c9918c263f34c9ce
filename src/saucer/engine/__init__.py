"""saucer.engine"""
