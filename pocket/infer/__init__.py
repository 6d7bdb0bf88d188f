"""pocket.infer"""
