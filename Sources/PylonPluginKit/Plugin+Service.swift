import PylonCore
import PylonProtocol

/// A plugin's service, built once from the host's welcome (its config and state directory) with
/// `let` dependencies, never before the handshake and never patched afterwards
/// (`Plugin.service(_:)`). The registration table names the service's methods before it exists:
/// `serve` makes each handler, which answers -32001 (`pluginUnavailable`) in the window before
/// the service is built. The host routes no request to a plugin before its handshake, so the
/// guard only covers a misbehaving sender; it is written here once, not in each plugin's main.
public final class Service<S: AnyObject> {
    /// The service, once `Plugin.onReady` built it.
    public private(set) var current: S?
    let name: String

    init(name: String) { self.name = name }

    /// The handler of a method served by the service: `method(service, call)`, or -32001 while the
    /// service does not exist yet.
    public func serve(_ method: @escaping (S, Call) -> Void) -> (Call) -> Void {
        { [unowned self] call in
            guard let s = self.current else {
                return call.fail(RPCError(.pluginUnavailable, "the \(self.name) plugin is starting"))
            }
            method(s, call)
        }
    }

    func set(_ s: S) { current = s }
}

extension Plugin {
    /// The plugin's service, built by `open` in `onReady` (after the handshake: `config`,
    /// `stateDir` and the consent snapshot are the host's). `open` exits the process itself when
    /// the configuration or the state cannot be used (exit 78, EX_CONFIG). Register the service's
    /// methods with `service.serve { … }`; other callbacks read `service.current`.
    public func service<S: AnyObject>(_ open: @escaping (Plugin) -> S) -> Service<S> {
        let holder = Service<S>(name: name)
        onReady = { [unowned self] in holder.set(open(self)) }
        return holder
    }
}
