print("backend placeholder")
