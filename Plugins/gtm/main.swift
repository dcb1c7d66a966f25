import PylonPluginKit
let plugin = Plugin(name: "gtm", version: "0.1.0")
plugin.run()
