"""bert_core"""
