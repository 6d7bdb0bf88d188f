"""pocket.train"""
