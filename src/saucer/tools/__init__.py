"""saucer.tools"""
