# bash completion for pylonctl. Method names come from the running host (`pylonctl describe --names`,
# i.e. bus.describe), so they follow the installed plugins.
_pylonctl() {
    local cur prev words cword
    _init_completion 2>/dev/null || { cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }
    local commands="call ping status describe sub monitor publish restart reload wait-ready log-level consent metrics dead-letters owner conformance help"
    local i cmd="" sock=()
    for ((i = 1; i < cword; i++)); do
        case ${words[i]} in
            --socket|-s) sock=(--socket "${words[i+1]}"); ((i++)) ;;
            --timeout|-t) ((i++)) ;;
            -*) ;;
            *) cmd=${words[i]}; break ;;
        esac
    done
    case $prev in
        --socket|-s) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --timeout|-t) return ;;
        --plugin) COMPREPLY=($(compgen -W "$(pylonctl "${sock[@]}" describe --names 2>/dev/null | cut -d. -f1 | sort -u)" -- "$cur")); return ;;
    esac
    if [[ $cur == -* && -n $cmd ]]; then
        COMPREPLY=($(compgen -W "--help --pretty --check --timeout --socket" -- "$cur"))
    fi
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "$commands --socket --timeout --check --help --version" -- "$cur"))
        return
    fi
    case $cmd in
        call)
            if [ $((cword - i)) -eq 1 ]; then
                COMPREPLY=($(compgen -W "$(pylonctl "${sock[@]}" describe --names 2>/dev/null)" -- "$cur"))
            fi ;;
        consent)
            case $((cword - i)) in
                1) COMPREPLY=($(compgen -W "list get set clear" -- "$cur")) ;;
                3) COMPREPLY=($(compgen -W "allow deny grant revoke true false" -- "$cur")) ;;
            esac ;;
        owner)
            case $((cword - i)) in
                1) COMPREPLY=($(compgen -W "set release" -- "$cur")) ;;
                2) COMPREPLY=($(compgen -W "uploader ma push" -- "$cur")) ;;
            esac ;;
        restart)
            COMPREPLY=($(compgen -W "$(pylonctl "${sock[@]}" describe --names 2>/dev/null | cut -d. -f1 | sort -u)" -- "$cur")) ;;
        status|reload) COMPREPLY+=($(compgen -W "--json" -- "$cur")) ;;
        describe)
            if [[ $cur == -* ]]; then COMPREPLY+=($(compgen -W "--json --names --openrpc" -- "$cur"))
            else COMPREPLY=($(compgen -W "$(pylonctl "${sock[@]}" describe --names 2>/dev/null)" -- "$cur")); fi ;;
        monitor)
            if [[ $cur == -* ]]; then COMPREPLY+=($(compgen -W "--verbose --json" -- "$cur"))
            else COMPREPLY=($(compgen -W "$(pylonctl "${sock[@]}" describe --names 2>/dev/null | sed 's/\..*/.*/' | sort -u)" -- "$cur")); fi ;;
        log-level)
            if [[ $cur == -* ]]; then COMPREPLY+=($(compgen -W "--plugin" -- "$cur"))
            else COMPREPLY=($(compgen -W "debug info warn error" -- "$cur")); fi ;;
        help) COMPREPLY=($(compgen -W "$commands" -- "$cur")) ;;
    esac
}
complete -F _pylonctl pylonctl
