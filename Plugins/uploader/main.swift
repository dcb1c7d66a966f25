print("uploader placeholder")
