"""saucer.service"""
