/// One AppKey's app session (docs/MA.md, "Events and sessions") as a value-type machine on an
/// injected clock. A session starts with the first activity and ends `timeoutMs` after the last
/// activity in the background (going to the background counts as one; a client that disconnects
/// counts as going there). Every input carries `now` (ms, monotonic: the plugin's loop time);
/// the effects are performed in order by the shell (`MAService+Session.swift`), which records the
/// session events, persists the instance and keeps the one libuv timer on `deadline`.
struct MASession: Equatable {
    /// The current session; nil between sessions.
    var id: String?
    var background = false
    /// When the session ends unless there is activity first; set only in the background.
    private(set) var deadline: UInt64?

    init(id: String? = nil, background: Bool = false) {
        self.id = id
        self.background = background
    }

    enum Effect: Equatable {
        /// Record `el_session_start` for session `id`.
        case started(id: String)
        /// Record `el_session_end` for session `id` (the machine is between sessions now).
        case ended(id: String)
        /// The persisted part (`id`, `background`) changed.
        case persist
        /// (Re)arm the timer to fire at `at` (the clock of `now`).
        case arm(at: UInt64)
        case cancel
    }

    /// Activity (an event recorded): starts a session if there is none; in the background it
    /// moves the end to `timeoutMs` from now.
    mutating func touch(now: UInt64, timeoutMs: UInt64, newId: () -> String) -> [Effect] {
        var out: [Effect] = []
        if id == nil {
            let s = newId()
            id = s
            out += [.started(id: s), .persist]
        }
        if background { out.append(arm(now: now, timeoutMs: timeoutMs)) }
        return out
    }

    /// The app went to the background (the end is `timeoutMs` from now) or came back (no end).
    mutating func setBackground(_ bg: Bool, now: UInt64, timeoutMs: UInt64) -> [Effect] {
        var out: [Effect] = []
        if background != bg {
            background = bg
            out.append(.persist)
        }
        if bg {
            out.append(arm(now: now, timeoutMs: timeoutMs))
        } else {
            deadline = nil
            out.append(.cancel)
        }
        return out
    }

    /// After a restart: a session left in the background ends a full timeout from now.
    mutating func restored(now: UInt64, timeoutMs: UInt64) -> [Effect] {
        guard background, id != nil else { return [] }
        return [arm(now: now, timeoutMs: timeoutMs)]
    }

    /// The timer fired at `now`: the session ends if its deadline has come (a timer that fired
    /// early is armed again for it).
    mutating func timerFired(now: UInt64) -> [Effect] {
        guard let d = deadline else { return [] }
        guard now >= d else { return [.arm(at: d)] }
        deadline = nil
        guard let s = id else { return [] }
        id = nil
        return [.ended(id: s), .persist]
    }

    private mutating func arm(now: UInt64, timeoutMs: UInt64) -> Effect {
        let d = now + max(1, timeoutMs)
        deadline = d
        return .arm(at: d)
    }
}
