#!/usr/bin/env bash
# The database the CPU profile's containers use (`make stack-up`): the host's PostgreSQL at
# 127.0.0.1:5432, role and database `cascade`, the role's password POSTGRES_PASSWORD from
# deploy/.env. Creates what is missing and changes nothing that exists (an existing role keeps
# its password: if it is not POSTGRES_PASSWORD, the API container says so when it cannot log
# in); does nothing when deploy/.env or the environment sets CASCADE_DB_URL (your own database).
set -euo pipefail

env_file="${1:-deploy/.env}"
value() {  # a variable from the environment, else from deploy/.env (last assignment wins)
    local name="$1"
    if [ -n "${!name:-}" ]; then printf '%s' "${!name}"; return; fi
    if [ -f "$env_file" ]; then
        sed -n "s/^${name}=//p" "$env_file" | tail -n1 | sed -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'$/\1/"
    fi
}

if [ -n "$(value CASCADE_DB_URL)" ]; then
    echo "stack database: CASCADE_DB_URL is set (your own database): nothing to create"
    exit 0
fi
password="$(value POSTGRES_PASSWORD)"
password="${password:-cascade}"

admin=(psql -h 127.0.0.1 -p 5432 -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA)
if ! "${admin[@]}" -c 'SELECT 1' >/dev/null 2>&1; then
    echo "error: cannot connect to PostgreSQL at 127.0.0.1:5432 as postgres to create the stack's" \
        "role and database: create role 'cascade' (password POSTGRES_PASSWORD of deploy/.env) and" \
        "database 'cascade' yourself, or set CASCADE_DB_URL in deploy/.env" >&2
    exit 1
fi
if [ "$("${admin[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = 'cascade'")" != "1" ]; then
    "${admin[@]}" -v pw="$password" <<<"CREATE ROLE cascade LOGIN PASSWORD :'pw';"
    echo "stack database: created role cascade"
fi
if [ "$("${admin[@]}" -c "SELECT 1 FROM pg_database WHERE datname = 'cascade'")" != "1" ]; then
    "${admin[@]}" -c "CREATE DATABASE cascade OWNER cascade"
    echo "stack database: created database cascade"
fi
echo "stack database: postgresql://cascade:***@127.0.0.1:5432/cascade ready"
