"""pocket.export"""
