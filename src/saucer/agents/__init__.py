"""saucer.agents"""
