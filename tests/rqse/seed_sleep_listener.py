# ruff: noqa: E501
# The SleepListener example from the predecessor system's README
# (shared/seeds/002), unchanged: not even the import line needed editing.
from time import sleep

from rqse import EventListener, message, receipt_for


class SleepListener(EventListener):
    def __init__(
        self,
        key,
        group="sleeping",
        host="0.0.0.0",
        port=6379,
        username=None,
        password=None,
        pool=None,
    ):
        super().__init__(
            key,
            group,
            select=["start-task"],
            host=host,
            port=port,
            username=username,
            password=password,
            pool=pool,
        )

    def process(self, event_id, event):

        # start-task events all have workflow, name, index, input, and parameters
        workflow_id = event.get("workflow")
        name = event.get("name")
        category, _, task_name = name.partition(":")
        if category == "sleep":
            return False

        index = event.get("index")
        parameters = event.get("parameters", {})
        duration = int(parameters.get("for", 60))

        # Since we are going to process this, we send a receipt
        self.append(receipt_for(event_id))

        sleep(duration)

        end_event = {"name": name, "index": index, "workflow": workflow_id, "status": "SUCCESS"}
        self.append(message(end_event, kind="end-task"))
        return True


if __name__ == "__main__":
    listener = SleepListener("workflow:run")
    listener.listen()
