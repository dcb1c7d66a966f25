enum PylonHTTPPlaceholder {}
