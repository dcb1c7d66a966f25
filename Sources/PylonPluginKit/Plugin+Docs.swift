/// Method descriptions: what `bus.describe` (and its OpenRPC form) shows for each method.
extension Plugin {
    /// Declares what `<plugin>.<method>` takes and answers; sent in the `bus.hello` manifest
    /// with the method (a doc for a method the plugin does not serve is not sent). Declare it
    /// before `run()`, beside or after the method's registration:
    ///
    /// ```swift
    /// plugin.describe("echo", MethodDoc("Answers its params", result: .init(.any, "the params")))
    /// ```
    public func describe(_ short: String, _ doc: MethodDoc) {
        methodDocs[short.hasPrefix(name + ".") ? short : name + "." + short] = doc
    }

    /// The methods served without a doc (full names, in registration order): a plugin's test
    /// can require this to be empty.
    public var undocumentedMethods: [String] { methodOrder.filter { methodDocs[$0] == nil } }
}
